#include "core/calibrate/turns.hpp"

#include <algorithm>
#include <span>

namespace braid::calibrate {

Turns Turns::on_host(runtime::Communicator& all, int local_index, int local_count, int cores, int threads) {
  const int per_turn = std::min(local_count, std::max(1, cores / std::max(1, threads)));
  int most[1] = {(local_count + per_turn - 1) / per_turn};
  all.allreduce(std::span<int>(most), runtime::ReduceOp::max);
  return Turns(all, most[0], local_index / per_turn, per_turn);
}

void Turns::before_case() {
  barriers(started_ ? turns_ - mine_ : 1);
  barriers(mine_);
  started_ = true;
}

void Turns::end() {
  if (started_) barriers(turns_ - mine_);
  started_ = false;
}

void Turns::barriers(int n) {
  for (int i = 0; i < n; ++i) all_.barrier();
}

}  // namespace braid::calibrate
