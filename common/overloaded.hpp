// Overloaded{lambda...}: one visitor out of several lambdas, for std::visit over the
// scheduler's Outcome and the peer protocol's Message variants.
#pragma once

namespace gradlane::detail {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace gradlane::detail
