// The trainer's data-parallel gradient all-reduce (train::post_allreduce_gradients) in real
// processes: run by ctest as `mpiexec -n 2` and `-n 4`; argv[1] is the process count to
// expect. Laid out end to end (nn::FlatParameters) the gradients are summed where they lie,
// with no buffer; apart, through one; and replicas that differ in that still agree, since the
// order of the sum comes from the parameters alone (nn::layout_order).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/nn/flat_parameters.hpp"
#include "core/nn/host_ops.hpp"
#include "core/train/stage_work.hpp"
#include "tests/mpi/checks.hpp"

namespace braid {
namespace {

// Three trainable parameters, decay / none / decay, so layout_order differs from the given
// order, and a frozen one that takes no part. Rank r's gradient element i of parameter k is
// 1000 r + 100 k + i: the sum over n ranks is 1000 n(n-1)/2 + n (100 k + i).
struct Module {
  std::vector<nn::Parameter> params = std::vector<nn::Parameter>(4);
  std::vector<nn::AdamWState> states = std::vector<nn::AdamWState>(4);

  explicit Module(int rank) {
    const std::int64_t sizes[] = {5, 3, 7, 2};
    for (std::size_t k = 0; k < params.size(); ++k) {
      nn::Parameter& p = params[k];
      p.name = "m." + std::to_string(k);
      p.decay = k != 1;
      p.trainable = k != 3;
      p.value = nn::Tensor({sizes[k]});
      p.grad = nn::Tensor({sizes[k]});
      for (std::int64_t i = 0; i < sizes[k]; ++i)
        p.grad.data[static_cast<std::size_t>(i)] = static_cast<float>(1000 * rank + 100 * int(k) + i);
    }
  }
  std::vector<nn::Parameter*> pointers() {
    std::vector<nn::Parameter*> out;
    for (auto& p : params) out.push_back(&p);
    return out;
  }
};

void check_sums(Module& m, int n, int rank, test::Checks& check, const std::string& what) {
  for (std::size_t k = 0; k < 3; ++k)
    for (std::size_t i = 0; i < m.params[k].grad.data.size(); ++i) {
      const double want = 1000.0 * n * (n - 1) / 2 + n * (100.0 * double(k) + double(i));
      check(m.params[k].grad.data[i] == static_cast<float>(want),
            what + ": parameter " + std::to_string(k) + " element " + std::to_string(i) + " is " +
                std::to_string(m.params[k].grad.data[i]) + ", not " + std::to_string(want));
    }
  check(m.params[3].grad.data[0] == static_cast<float>(1000 * rank + 300), what + ": the frozen one changed");
}

// `laid_out(rank)`: whether that rank lays its gradients out end to end first.
void reduce(runtime::World& world, bool (*laid_out)(int), const std::string& what, test::Checks& check) {
  const int n = world.size(), rank = world.rank();
  nn::HostOps ops(1);
  Module m(rank);
  std::optional<nn::FlatParameters> flat;
  if (laid_out(rank)) flat.emplace(ops, nn::trainable_members(m.pointers(), m.states));
  const float* first = m.params[0].grad.ptr();
  train::CommBytes bytes;
  train::Pending posted = train::post_allreduce_gradients(ops, world.communicator(), m.pointers(), bytes);
  const std::size_t held = bytes.in_flight;
  posted.finish();
  check(held == (laid_out(rank) ? 0 : 15 * sizeof(float)),
        what + ": " + std::to_string(held) + " bytes of buffer while in flight");
  check(bytes.in_flight == 0, what + ": the buffer outlived the all-reduce");
  check(m.params[0].grad.ptr() == first, what + ": a gradient was given new memory");
  check_sums(m, n, rank, check, what);
  check.passed(what.c_str());
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  int expected = 0;
  std::optional<braid::runtime::World> world =
      braid::test::plugin_world(argc, argv, "run it under mpiexec -n N", expected);
  braid::test::Checks check(*world);
  try {
    check(world->size() == expected, "world size " + std::to_string(world->size()));
    braid::reduce(
        *world, [](int) { return true; }, "laid out: summed in place", check);
    braid::reduce(
        *world, [](int) { return false; }, "apart: through a buffer", check);
    braid::reduce(
        *world, [](int r) { return r % 2 == 0; }, "laid out on even ranks only", check);
    world->communicator().barrier();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  if (world->rank() == 0) std::printf("all %d checks passed on rank 0\n", check.count());
  world.reset();
  return 0;
}
