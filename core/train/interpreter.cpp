#include "core/train/interpreter.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "core/common/error.hpp"

namespace braid::train {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Interpreter::set(pipeline::Op op, Handler handler) { table_[static_cast<std::size_t>(op)] = std::move(handler); }

std::vector<Executed> Interpreter::run(const std::vector<pipeline::Instruction>& list, const FillRules* fill,
                                       const std::function<void(const std::exception_ptr&)>& on_error) const {
  const int n = static_cast<int>(list.size());
  std::vector<char> done(static_cast<std::size_t>(n), 0);
  std::map<int, std::pair<Pending, double>> started;  // movable receives posted early, with their start
  std::vector<Executed> ran;
  ran.reserve(list.size());
  int next_movable = 0;  // no movable instruction before it is pending

  std::vector<double> inside(static_cast<std::size_t>(n), 0.0);  // Executed::waited_inside
  auto start = [&](int i) {
    const auto& ins = list[static_cast<std::size_t>(i)];
    const Handler& h = table_[static_cast<std::size_t>(ins.op)];
    if (!h) throw Error(Status::internal, std::string("the executor has no handler for ") + pipeline::op_name(ins.op));
    const double booked = booked_ ? booked_() : 0;
    Pending p = h(ins);
    if (booked_) inside[static_cast<std::size_t>(i)] = booked_() - booked;
    return p;
  };
  auto complete = [&](int i, Pending& p, double t0) {
    const double waited = p.empty() ? 0 : p.finish();
    done[static_cast<std::size_t>(i)] = 1;
    ran.push_back({i, t0, now_seconds(), waited, inside[static_cast<std::size_t>(i)]});
    if (after_) after_();
  };
  // Runs the first pending movable instruction after `pc` if its inputs are there and it
  // does not wait; false when there is nothing to do without blocking.
  auto fill_one = [&](int pc) {
    int q = std::max(next_movable, pc + 1);
    while (q < n && (done[static_cast<std::size_t>(q)] || !fill->movable(q))) ++q;
    next_movable = q;
    if (q >= n) return false;
    if (auto it = started.find(q); it != started.end()) {
      if (!it->second.first.test()) return false;
      complete(q, it->second.first, it->second.second);
      started.erase(it);
      return true;
    }
    if (!fill->ready(q)) return false;
    const double t0 = now_seconds();
    Pending p = start(q);
    if (!p.empty() && !p.test()) {
      started.emplace(q, std::make_pair(std::move(p), t0));
      return false;
    }
    complete(q, p, t0);
    return true;
  };

  try {
    for (int pc = 0; pc < n; ++pc) {
      if (done[static_cast<std::size_t>(pc)]) continue;
      double t0 = now_seconds();
      Pending p;
      if (auto it = started.find(pc); it != started.end()) {
        p = std::move(it->second.first);
        t0 = it->second.second;
        started.erase(it);
      } else {
        p = start(pc);
      }
      if (fill && !p.empty()) {
        while (!p.test() && fill_one(pc)) {
        }
      }
      complete(pc, p, t0);
    }
  } catch (...) {
    if (on_error) on_error(std::current_exception());
    throw;
  }
  return ran;
}

}  // namespace braid::train
