// gradlane_write_bw / gradlane_read_bw: perftest's BW method on the public API.
//
// The client keeps up to -t operations in flight per QP, stamps every post and every
// completion with the TSC, and signals one operation in -Q (the last one always), exactly
// as perftest's run_iter_bw. A signalled completion proves every earlier operation on its QP
// done (RC completes in order), which is how Connection::stats().completed advances. The
// server only hosts the buffer: it sleeps until the client reports.
#include <algorithm>
#include <iostream>

#include "common/facts.hpp"
#include "common/report.hpp"
#include "common/session.hpp"
#include "common/ticks.hpp"
#include "common/tool.hpp"

namespace gradlane::perf {
namespace {

using Clock = std::chrono::steady_clock;

struct Lane {  // one QP's share of the run
  Connection* connection;
  RegionDescriptor remote;
  std::uint64_t posted = 0, done = 0;
  OpId first_op = 0;
  bool closed = false;  // its last (signalled) operation is posted
};

struct LoopSettings {
  Verb verb;
  std::size_t bytes;
  std::uint64_t iterations;  // per QP; ignored with a duration
  int duration;              // seconds, 0 = iterations
  int tx_depth;
  int cq_mod;
};

BwSample run_loop(std::vector<Lane>& lanes, const MemoryRegion& local, const LoopSettings& run) {
  BwSample sample;
  sample.bytes = run.bytes;
  sample.qps = static_cast<int>(lanes.size());
  const bool timed = run.duration > 0;
  if (!timed) {
    sample.posted.reserve(run.iterations * lanes.size());
    sample.completed.reserve(run.iterations * lanes.size());
  }
  const auto wall0 = Clock::now();
  const auto stop_at = wall0 + std::chrono::seconds(run.duration);
  bool stopping = false;
  std::uint64_t passes = 0;

  auto finished = [&](const Lane& l) { return l.closed && l.done == l.posted; };
  while (!std::all_of(lanes.begin(), lanes.end(), finished)) {
    // -D: a clock read is ~1.35 µs in the VM (HPET), so look at it every 16th pass only.
    if (timed && !stopping && ++passes % 16 == 0 && Clock::now() >= stop_at) stopping = true;
    for (Lane& l : lanes) {
      while (!l.closed && l.posted - l.done < static_cast<std::uint64_t>(run.tx_depth)) {
        const bool last = timed ? stopping : l.posted + 1 == run.iterations;
        const bool signal = last || (l.posted + 1) % static_cast<std::uint64_t>(run.cq_mod) == 0;
        const Ticks t = now_ticks();
        const OpId op = run.verb == Verb::write ? l.connection->write(local, 0, l.remote, 0, run.bytes,
                                                                      signal ? Signal::always : Signal::automatic)
                                                : l.connection->read(local, 0, l.remote, 0, run.bytes);
        if (l.posted == 0) l.first_op = op;
        if (sample.operations == 0) sample.first_post = t;
        if (!timed) sample.posted.push_back(t);
        ++l.posted;
        ++sample.operations;
        l.closed = last;
      }
    }
    for (Lane& l : lanes) {
      if (l.done == l.posted || l.connection->poll() == 0) continue;
      const OpId completed = l.connection->stats().completed;
      if (completed < l.first_op) continue;
      const std::uint64_t now_done = std::min<std::uint64_t>(l.posted, completed - l.first_op + 1);
      const Ticks t = now_ticks();
      if (!timed) sample.completed.insert(sample.completed.end(), now_done - l.done, t);
      l.done = now_done;
      sample.last_completion = t;
    }
  }
  sample.wall_seconds = std::chrono::duration<double>(Clock::now() - wall0).count();
  sample.iterations = timed ? sample.operations / lanes.size() : run.iterations;
  return sample;
}

int serve(const PerfOptions& o, Session& s) {
  const RunPlan& plan = s.plan();
  const MemoryRegion& mr =
      s.register_buffer(plan.max_size(), o.kind.verb == Verb::write ? Access::remote_write : Access::remote_read);
  s.publish(mr);
  s.send_line("ready");
  const HeaderFacts facts = header_facts(o, s);
  std::cout << header_block(facts) << bw_title(o.report_gbits) << std::flush;
  nlohmann::json results = nlohmann::json::array();
  for (const std::size_t bytes : plan.sizes) {
    s.barrier(bytes);
    const std::string line = s.expect("result");
    std::cout << line << '\n' << std::flush;
    if (auto row = parse_bw_line(line)) results.push_back(to_json(*row, o.report_gbits));
  }
  s.finish();
  std::cout << kResultLine;
  if (o.json_file) write_json_file(*o.json_file, {{"test_info", test_info_json(facts)}, {"results", results}});
  return 0;
}

int drive(const PerfOptions& o, Session& s, const TickRate& rate) {
  const RunPlan& plan = s.plan();
  const MemoryRegion& mr =
      s.register_buffer(plan.max_size(), o.kind.verb == Verb::write ? Access::local : Access::local_write);
  s.expect("ready");
  std::vector<Lane> lanes;
  for (std::size_t q = 0; q < s.connections().size(); ++q) lanes.push_back({&s.connections()[q], s.peer_region(q)});
  const HeaderFacts facts = header_facts(o, s);
  std::cout << header_block(facts) << bw_title(o.report_gbits) << std::flush;
  nlohmann::json results = nlohmann::json::array();
  PerfOptions rule = o;
  rule.tx_depth = plan.tx_depth;
  for (const std::size_t bytes : plan.sizes) {
    s.barrier(bytes);
    for (Lane& l : lanes) l = Lane{l.connection, l.remote};
    const LoopSettings run{o.kind.verb, bytes, plan.iterations, plan.duration, plan.tx_depth, rule.cq_mod_for(bytes)};
    const BwSample sample = run_loop(lanes, mr, run);
    const BwRow row = bw_row(sample, rate.ticks_per_usec(), o.report_gbits);
    std::string line = bw_line(row, o.report_gbits);
    std::cout << line << std::flush;
    line.pop_back();  // the newline
    s.send_line("result " + line);
    results.push_back(to_json(row, o.report_gbits));
    results.back()["wall_seconds"] = sample.wall_seconds;
    results.back()["ticks_per_usec"] = rate.ticks_per_usec();
  }
  s.finish();
  std::cout << kResultLine;
  if (o.json_file) write_json_file(*o.json_file, {{"test_info", test_info_json(facts)}, {"results", results}});
  return 0;
}

}  // namespace

int bandwidth_main(const ToolKind& kind, int argc, char** argv) {
  const PerfOptions o = parse_options(kind, argc, argv);
  return guarded(kind.name, [&] {
    const TickRate rate;
    Session s = Session::establish(o);
    return s.is_server() ? serve(o, s) : drive(o, s, rate);
  });
}

}  // namespace gradlane::perf
