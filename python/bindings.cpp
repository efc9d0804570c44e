// gradlane for Python: the parameter server's server, replica and worker over the public API,
// the worker's registered buffers as numpy arrays that are views of them (no copy between
// numpy, torch.from_numpy and the wire), and every gradlane::Error as gradlane.Error carrying
// its category. Blocking calls release the GIL, so a server and workers may run on threads of
// one interpreter.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradlane/gradlane.hpp"
#include "gradlane/metrics.hpp"
#include "gradlane/ps/metrics.hpp"

namespace py = pybind11;

namespace gradlane::python {
namespace {

Millis seconds(double s) {
  if (!(s >= 0.0) || s > 86400.0) {
    throw Error(Errc::invalid_argument, "a timeout of " + std::to_string(s) + " s: give seconds in [0, 86400]");
  }
  return std::chrono::duration_cast<Millis>(std::chrono::duration<double>(s));
}

// A one-dimensional float32 array over `data`, kept alive by `owner`: the memory itself.
py::array_t<float> view(std::span<const float> data, py::handle owner, bool writable) {
  py::array_t<float> array({static_cast<py::ssize_t>(data.size())}, {static_cast<py::ssize_t>(sizeof(float))},
                           data.data(), owner);
  if (!writable) array.attr("setflags")(py::arg("write") = false);
  return array;
}

std::vector<float> initial_model(
    std::size_t floats, const std::optional<py::array_t<float, py::array::c_style | py::array::forcecast>>& initial) {
  if (!initial) return std::vector<float>(floats, 0.0F);
  const py::buffer_info info = initial->request();
  if (info.ndim != 1 || static_cast<std::size_t>(info.shape[0]) != floats || info.strides[0] != sizeof(float)) {
    throw Error(Errc::invalid_argument, "initial holds " + std::to_string(info.size) + " floats in " +
                                            std::to_string(info.ndim) + " dimension(s); the shard needs " +
                                            std::to_string(floats) + " contiguous float32 values");
  }
  const auto* first = static_cast<const float*>(info.ptr);
  return {first, first + floats};
}

// Attached to the host's gradlaned at `shm_name` (GRADLANE_SIDECAR_* as for every program).
sidecar::AttachOptions attach_options(const std::string& shm_name, std::uint32_t endpoint, std::uint32_t job) {
  sidecar::AttachOptions attach = sidecar::AttachOptions::from_env();
  attach.shm_name = shm_name;
  attach.endpoint = endpoint;
  attach.job = job;
  return attach;
}

void translate_errors(py::module_& m) {
  m.attr("Error") = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc("gradlane.Error",
                                "A gradlane failure: str() says what failed and what to do; .code is its category "
                                "(e.g. 'device_not_found', 'timeout'), .errno the failing call's errno or 0.",
                                PyExc_RuntimeError, nullptr));
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const Error& e) {
      const py::object type = py::module_::import("gradlane._gradlane").attr("Error");
      const py::object error = type(e.what());
      error.attr("code") = std::string(errc_name(e.code()));
      error.attr("errno") = e.sys_errno();
      PyErr_SetObject(type.ptr(), error.ptr());
    }
  });
}

void bind_device(py::module_& m) {
  py::class_<Device>(m, "Device", "An RDMA device and its protection domain.")
      .def_static(
          "open",
          [](const std::string& name, int gid_index) {
            return std::make_unique<Device>(Device::open({.name = name, .gid_index = gid_index}));
          },
          py::arg("name") = "", py::arg("gid_index") = -1,
          "Opens the device named (empty: the only one); gid_index -1 takes GRADLANE_GID_INDEX or the automatic "
          "choice.")
      .def_static("list", &Device::list, "Names of the RDMA devices present.")
      .def_property_readonly("name", [](const Device& d) { return d.info().name; })
      .def_property_readonly("address", [](const Device& d) { return d.info().ipv4_address; });
}

void bind_server(py::module_& m) {
  py::class_<ps::ServerStats>(m, "ServerStats")
      .def_readonly("granted", &ps::ServerStats::granted)
      .def_readonly("applied", &ps::ServerStats::applied)
      .def_readonly("skipped", &ps::ServerStats::skipped)
      .def_readonly("peers_lost", &ps::ServerStats::peers_lost)
      .def_readonly("peers_left", &ps::ServerStats::peers_left)
      .def_readonly("replica_acked", &ps::ServerStats::replica_acked);

  py::class_<ps::ShardServer>(m, "ShardServer", "A parameter-server shard: the server, or its replica.")
      .def(py::init([](const Device& device, const std::string& role, std::uint16_t port, std::size_t floats,
                       float learning_rate, float momentum, std::uint32_t slots,
                       const std::optional<py::array_t<float, py::array::c_style | py::array::forcecast>>& initial,
                       const std::optional<std::string>& sidecar, std::uint32_t endpoint, std::uint32_t job,
                       std::uint32_t tensor) {
             if (role != "server" && role != "replica") {
               throw Error(Errc::invalid_argument, "role '" + role + "': a shard is a 'server' or a 'replica'");
             }
             ps::ShardOptions options;
             options.floats = floats;
             options.learning_rate = learning_rate;
             options.momentum = momentum;
             options.slots = slots;
             options.tensor = tensor;
             options.transport = TransportOptions::from_env();
             if (sidecar) options.sidecar = attach_options(*sidecar, endpoint, job);
             const std::vector<float> model = initial_model(floats, initial);
             return std::make_unique<ps::ShardServer>(device, role == "server" ? ps::Role::server : ps::Role::replica,
                                                      port, options, model);
           }),
           py::arg("device"), py::arg("role"), py::arg("port"), py::arg("floats"), py::arg("learning_rate") = 0.01F,
           py::arg("momentum") = 0.0F, py::arg("slots") = 8U, py::arg("initial") = py::none(),
           py::arg("sidecar") = py::none(), py::arg("endpoint") = 0U, py::arg("job") = 1U, py::arg("tensor") = 0U,
           py::keep_alive<1, 2>(),
           "sidecar: the shm name of this host's gradlaned, which then owns the shard's sequence (the server's "
           "endpoint and job as the workers' requests name them). tensor: the tensor this shard holds; a Worker "
           "of another tensor is refused when it connects.")
      .def_property_readonly("port", &ps::ShardServer::port)
      .def(
          "connect_replica",
          [](ps::ShardServer& s, const std::string& replica, double timeout_s) {
            const ps::Endpoint at = ps::Endpoint::parse(replica);
            const Millis timeout = seconds(timeout_s);
            const py::gil_scoped_release unlocked;
            s.connect_replica(at.address, at.port, timeout);
          },
          py::arg("replica"), py::arg("timeout") = 30.0)
      .def(
          "accept_peers",
          [](ps::ShardServer& s, std::size_t workers, double timeout_s) {
            const Millis timeout = seconds(timeout_s);
            const py::gil_scoped_release unlocked;
            s.accept_peers(workers, timeout);
          },
          py::arg("workers"), py::arg("timeout") = 60.0)
      .def(
          "run_until",
          [](ps::ShardServer& s, std::uint64_t version, double timeout_s) {
            const Millis timeout = seconds(timeout_s);
            const py::gil_scoped_release unlocked;
            return s.run_until(version, timeout);
          },
          py::arg("version"), py::arg("timeout") = 60.0,
          "Applies updates in sequence order until the model reaches `version` (True) or the job finished first.")
      .def_property_readonly("version", &ps::ShardServer::version)
      .def_property_readonly("finished", &ps::ShardServer::finished)
      .def_property_readonly("stats", &ps::ShardServer::stats, py::return_value_policy::copy)
      .def_property_readonly(
          "model", [](py::object self) { return view(self.cast<const ps::ShardServer&>().model(), self, false); },
          "The shard, read-only and not copied: read it between run_until() calls.");
}

void bind_worker(py::module_& m) {
  py::class_<ps::PullResult>(m, "PullResult")
      .def_readonly("version", &ps::PullResult::version)
      .def_readonly("attempts", &ps::PullResult::attempts);
  py::class_<ps::PushResult>(m, "PushResult")
      .def_readonly("sequence", &ps::PushResult::sequence)
      .def_readonly("dropped", &ps::PushResult::dropped)
      .def_readonly("lost", &ps::PushResult::lost)
      .def_property_readonly(
          "wire_seconds", [](const ps::PushResult& r) { return std::chrono::duration<double>(r.wire_time).count(); });

  py::class_<ps::Worker>(m, "Worker", "A parameter-server worker: pushes its gradient, pulls the model.")
      .def(py::init([](const Device& device, const std::string& server, std::size_t floats, std::uint32_t id,
                       const std::optional<std::string>& replica, bool mirror, double timeout_s,
                       const std::optional<std::string>& sidecar, std::uint32_t endpoint, std::uint32_t server_endpoint,
                       std::uint32_t job, std::uint32_t tensor) {
             ps::WorkerOptions options;
             options.id = id;
             options.tensor = tensor;
             options.server = ps::Endpoint::parse(server);
             if (replica) options.replica = ps::Endpoint::parse(*replica);
             options.mirror = mirror;
             options.floats = floats;
             options.timeout = seconds(timeout_s);
             options.transport = TransportOptions::from_env();
             if (sidecar) {
               options.sidecar = attach_options(*sidecar, endpoint, job);
               options.server_endpoint = server_endpoint;
             }
             const py::gil_scoped_release unlocked;
             return std::make_unique<ps::Worker>(device, options);
           }),
           py::arg("device"), py::arg("server"), py::arg("floats"), py::arg("id") = 1U, py::arg("replica") = py::none(),
           py::arg("mirror") = true, py::arg("timeout") = 30.0, py::arg("sidecar") = py::none(),
           py::arg("endpoint") = 0U, py::arg("server_endpoint") = 0U, py::arg("job") = 1U, py::arg("tensor") = 0U,
           py::keep_alive<1, 2>(),
           "sidecar: the shm name of this host's gradlaned, which grants each push (this worker's NIC endpoint, "
           "its server's endpoint and the job). tensor: the shard's (ShardServer's tensor), checked on connect.")
      .def_property_readonly(
          "gradient",
          [](py::object self) {
            const std::span<float> g = self.cast<ps::Worker&>().gradient();
            return view(g, self, true);
          },
          "The registered gradient buffer, writable: compute into it (torch.from_numpy shares it too).")
      .def_property_readonly(
          "model", [](py::object self) { return view(self.cast<const ps::Worker&>().model(), self, false); },
          "The model the last pull() read, read-only and not copied.")
      .def(
          "pull",
          [](ps::Worker& w) {
            const py::gil_scoped_release unlocked;
            return w.pull();
          },
          "Reads a consistent snapshot of the model into .model.")
      .def(
          "server_version",
          [](ps::Worker& w) {
            const py::gil_scoped_release unlocked;
            return w.server_version();
          },
          "The server's model version, with one small READ of the shard's header and no model transfer: for "
          "waiting on a version (a synchronous step's barrier).")
      .def(
          "push",
          [](ps::Worker& w, std::uint64_t computed_on, std::uint64_t tag) {
            const py::gil_scoped_release unlocked;
            return w.push(computed_on, tag);
          },
          py::arg("computed_on"), py::arg("tag") = 0,
          "Pushes .gradient, computed on model version `computed_on`; returns once the server has it.")
      .def(
          "settle",
          [](ps::Worker& w, double timeout_s) {
            const Millis timeout = seconds(timeout_s);
            const py::gil_scoped_release unlocked;
            return w.settle(timeout);
          },
          py::arg("timeout") = 10.0);
}

// Prometheus metrics: an exporter serving the roles' sources; update()/record() from the thread
// that runs the role, scrapes (on the exporter's thread) never enter Python.
void bind_metrics(py::module_& m) {
  py::class_<prometheus::Collectable, std::shared_ptr<prometheus::Collectable>>(
      m, "MetricsSource", "What a MetricsExporter serves: ServerMetrics, WorkerMetrics.");
  py::class_<metrics::Exporter>(m, "MetricsExporter",
                                "Serves GET /metrics in Prometheus' text format on `bind` (ADDRESS:PORT; port 0: any).")
      .def(py::init<const std::string&>(), py::arg("bind"))
      .def_property_readonly("port", &metrics::Exporter::port)
      .def("add", &metrics::Exporter::add, py::arg("source"))
      .def("text", &metrics::Exporter::text, "What a scrape returns now.");
  py::class_<ps::ServerMetrics, prometheus::Collectable, std::shared_ptr<ps::ServerMetrics>>(
      m, "ServerMetrics",
      "A shard's metrics: updates applied and skipped, staleness by worker, replica lag, failovers.")
      .def(py::init<std::string, std::uint64_t>(), py::arg("role"), py::arg("update_bytes"))
      .def("update", py::overload_cast<const ps::ShardServer&>(&ps::ServerMetrics::update), py::arg("server"));
  py::class_<ps::WorkerMetrics, prometheus::Collectable, std::shared_ptr<ps::WorkerMetrics>>(
      m, "WorkerMetrics", "A worker's metrics: pushes by outcome and the time each took.")
      .def(py::init<std::uint32_t>(), py::arg("worker"))
      .def(
          "record",
          [](ps::WorkerMetrics& w, const ps::PushResult& result, double seconds_taken) {
            w.record(result, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::duration<double>(seconds_taken)));
          },
          py::arg("result"), py::arg("seconds"));
}

}  // namespace
}  // namespace gradlane::python

PYBIND11_MODULE(_gradlane, m) {
  m.doc() = "gradlane: RDMA parameter-server roles with zero-copy numpy views of their registered buffers";
  gradlane::python::translate_errors(m);
  gradlane::python::bind_device(m);
  gradlane::python::bind_server(m);
  gradlane::python::bind_worker(m);
  gradlane::python::bind_metrics(m);
}
