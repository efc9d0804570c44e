#include "common/facts.hpp"

#include <infiniband/verbs.h>

#include <algorithm>

namespace gradlane::perf {

HeaderFacts header_facts(const PerfOptions& options, Session& session) {
  const RunPlan& plan = session.plan();
  HeaderFacts f;
  f.options = &options;
  f.device = &session.device().info();
  f.qps = plan.qps;
  f.tx_depth = plan.tx_depth;
  f.cq_mod = plan.cq_mod > 0 ? std::min(plan.cq_mod, plan.tx_depth) : [&] {
    PerfOptions rule = options;
    rule.tx_depth = plan.tx_depth;
    return rule.cq_mod_for(plan.sizes.front());
  }();
  // What the library will really inline: the provider may grant more than was asked for.
  f.inline_granted = session.transport().max_inline;
  // The library asks for min(max_qp_rd_atom, max_qp_init_rd_atom, 16) outstanding READs
  // (device/device.cpp); DeviceInfo does not carry it, so the header recomputes it.
  ibv_device_attr attr{};
  if (ibv_query_device(session.device().context(), &attr) == 0) {
    f.outstanding_reads = std::max(1, std::min({attr.max_qp_rd_atom, attr.max_qp_init_rd_atom, 16}));
  }
  f.connection = session.control().describe();
  return f;
}

}  // namespace gradlane::perf
