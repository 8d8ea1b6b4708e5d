#include "core/train/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/common/error.hpp"
#include "core/common/file.hpp"
#include "core/common/text.hpp"

namespace braid::train {
namespace {

using nlohmann::ordered_json;

// nlohmann writes NaN and infinities as null; say so explicitly rather than rely on it.
ordered_json number(double v) { return std::isfinite(v) ? ordered_json(v) : ordered_json(nullptr); }

[[noreturn]] void io_error(const std::string& what, const std::string& path, int err) {
  throw Error(Status::io, what + " metrics file '" + path + "': " + std::strerror(err));
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_error("cannot write", path, n < 0 ? errno : EIO);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string number_text(double v, int digits) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fixed(v, digits);
}

// The kept lines of an earlier run's file, see MetricsWriter.
std::string lines_to_keep(const std::string& path, std::int64_t resume_step, std::int64_t& kept,
                          std::int64_t& dropped) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Status::io, "cannot read metrics file '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::string out;
  std::size_t at = 0;
  for (std::int64_t line_no = 1; at < text.size(); ++line_no) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos) {  // the writer died mid-line
      ++dropped;
      break;
    }
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    const ordered_json record = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      throw Error(Status::bad_config, "metrics file '" + path + "' line " + std::to_string(line_no) +
                                          " is not a metrics record (a JSON object with an integer \"step\"); "
                                          "move the file aside to resume");
    // A finished run's own records (its summary, memory, op profile) end that run; the
    // resumed run writes its own, so the file reads as one run.
    const bool run_record = record.contains("summary") || record.contains("memory") || record.contains("op_profile");
    if (record["step"].get<std::int64_t>() <= resume_step && !run_record) {
      out.append(line);
      out += '\n';
      ++kept;
    } else {
      ++dropped;
    }
  }
  return out;
}

// `text` becomes the file's contents atomically: temp file, fsync, rename.
void replace_file(const std::string& given, const std::string& text) {
  // Through a symbolic link to its file: the link stays a link. A device or a FIFO is
  // written to, never replaced.
  const std::string path = file_behind(given);
  if (is_special_file(path)) return write_file_atomically(path, text, "metrics file");  // writes it directly
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("cannot create", tmp, errno);
  try {
    write_all(fd, text, tmp);
    if (::fsync(fd) != 0) io_error("cannot sync", tmp, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_error("cannot rename " + tmp + " to", path, err);
  }
}

}  // namespace

std::string metrics_line(const StepMetrics& m) {
  const ordered_json j{{"step", m.step}, {"loss", number(m.loss)}, {"samples_per_s", number(m.samples_per_s)}};
  return j.dump();
}

std::string metrics_line(const EvalMetrics& m) {
  ordered_json j{{"eval", true}, {"step", m.step}};
  for (const auto& [name, value] : m.values) {
    if (name == "eval" || name == "step" || name.empty() || j.contains(name))
      throw Error(Status::invalid_argument, "metrics: evaluation value name '" + name + "' is reserved or repeated");
    j[name] = number(value);
  }
  return j.dump();
}

MetricsWriter::MetricsWriter(const std::string& path, std::optional<std::int64_t> resume_step) : path_(path) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND;
  std::error_code ec;
  if (!resume_step)
    flags |= O_TRUNC;
  else if (std::filesystem::exists(path, ec))
    replace_file(path, lines_to_keep(path, *resume_step, kept_, dropped_));
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) io_error("cannot open", path, errno);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write_line(const std::string& line) { write_all(fd_, line + "\n", path_); }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 3.6e9) return "?";
  const long long s = std::llround(seconds);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

ProgressMeter::ProgressMeter(std::int64_t total_steps, int window)
    : total_(total_steps), window_(static_cast<std::size_t>(window)) {
  if (window < 1) throw Error(Status::invalid_argument, "progress: the averaging window must be at least 1 step");
}

std::string ProgressMeter::update(std::int64_t step, double loss, double samples_per_s, double seconds) {
  if (std::isfinite(seconds) && seconds >= 0) {
    recent_.push_back(seconds);
    if (recent_.size() > window_) recent_.pop_front();
  }
  return "step " + std::to_string(step) + "/" + std::to_string(total_) + "  loss " + number_text(loss, 4) + "  " +
         number_text(samples_per_s, 1) + " samples/s  ETA " + format_duration(eta_seconds(step));
}

std::int64_t default_progress_interval(std::int64_t total_steps) {
  // The lines progress_due prints for a run from step 1: every multiple of `every`, step 1 and
  // the last step.
  const auto lines = [&](std::int64_t every) {
    return total_steps / every + (every > 1 ? 1 : 0) + (total_steps % every != 0 ? 1 : 0);
  };
  for (std::int64_t scale = 1;; scale *= 10) {
    for (std::int64_t m : {1, 2, 5}) {
      if (lines(m * scale) <= 20 || m * scale >= total_steps) return m * scale;
    }
  }
}

bool progress_due(std::int64_t step, std::int64_t first_step, std::int64_t total, std::int64_t every) {
  if (every <= 0) return false;
  return step == first_step || step == total || step % every == 0;
}

double ProgressMeter::eta_seconds(std::int64_t step) const {
  if (recent_.empty() || step >= total_) return 0;
  double sum = 0;  // re-summed each time: a running sum would drift over a long run
  for (double s : recent_) sum += s;
  return sum / static_cast<double>(recent_.size()) * static_cast<double>(total_ - step);
}

std::string format_summary(const RunSummary& s) {
  std::string out;
  const std::int64_t steps = s.last_step - s.first_step + 1;
  if (steps <= 0) {
    out += "nothing to train: the run is at step " + std::to_string(s.last_step) + " of " +
           std::to_string(s.total_steps) + "\n";
  } else {
    const double rate = s.seconds > 0 ? s.samples / s.seconds : 0;
    out += "trained steps " + std::to_string(s.first_step) + "-" + std::to_string(s.last_step) + " of " +
           std::to_string(s.total_steps) + " in " + format_duration(s.seconds) + " (" + fixed(s.samples, 0) +
           " samples, " + fixed(rate, 1) + " samples/s)\n";
    out += "final loss " + number_text(s.final_loss, 4) + "\n";
  }
  if (s.last_eval) {
    out += "eval at step " + std::to_string(s.last_eval->step) + ":";
    for (std::size_t i = 0; i < s.last_eval->values.size(); ++i)
      out += (i ? ", " : " ") + s.last_eval->values[i].first + " " + number_text(s.last_eval->values[i].second, 4);
    out += "\n";
  }
  if (!s.checkpoint.empty()) out += "checkpoint " + s.checkpoint + "\n";
  return out;
}

}  // namespace braid::train
