// What a training run reports: the --metrics JSON-lines file, the progress lines rank 0
// prints (every N steps, or one line rewritten in place on a terminal), and the summary.
//
// The metrics file holds one JSON object per line:
//   {"step":12,"loss":2.3456001281738281,"samples_per_s":184.2}
//   {"eval":true,"step":200,"retrieval_top1_i2t":0.8125,"retrieval_top1_t2i":0.796875}
// Numbers are written to full precision (so that two runs' losses can be compared bit for
// bit); a value that is not finite (a diverged loss) is written as null.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace braid::train {

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0;
  double samples_per_s = 0;
};

// An evaluation's metrics in the order given, e.g. retrieval_top1_i2t and retrieval_top1_t2i
// for CLIP, caption_loss and token_accuracy for the MLLM.
struct EvalMetrics {
  std::int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
};

// One line of the metrics file, without its newline.
std::string metrics_line(const StepMetrics& m);
std::string metrics_line(const EvalMetrics& m);  // Error(invalid_argument) for "eval" or "step" as a name

// Appends lines to a metrics file, each with one write() call and no buffering, so a run
// killed at any point keeps every line it finished.
//
// A new run (no resume_step) starts the file afresh: it is created or truncated. A resumed
// run (resume_step = the checkpoint's step) keeps the lines of steps <= resume_step and drops
// the rest, which the resumed run is about to compute again; the file then reads as if the
// run had never stopped. The kept lines are written to "<path>.tmp", fsynced and renamed over
// the file, so a crash while resuming loses nothing. A last line without its newline (the
// writer died mid-line) is dropped; any other line that is not a JSON object with an integer
// "step" is an Error(bad_config) naming the file and line, and the file is left as it was.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path, std::optional<std::int64_t> resume_step = std::nullopt);
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  void write(const StepMetrics& m) { write_line(metrics_line(m)); }
  void write(const EvalMetrics& m) { write_line(metrics_line(m)); }
  // `line` without a newline; Error(io) naming the file when it cannot be written.
  void write_line(const std::string& line);

  const std::string& path() const { return path_; }
  std::int64_t kept_lines() const { return kept_; }        // from the earlier run, when resuming
  std::int64_t dropped_lines() const { return dropped_; }  // past resume_step, or cut off mid-line

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t kept_ = 0;
  std::int64_t dropped_ = 0;
};

// "0:01:03"; hours grow past 24 ("27:03:05"); "?" for a negative or non-finite time.
std::string format_duration(double seconds);

// The progress line of rank 0, with the time left from a moving average of recent steps.
class ProgressMeter {
 public:
  // `total_steps`: the run's last step; `window`: how many recent steps the average spans.
  explicit ProgressMeter(std::int64_t total_steps, int window = 20);

  // After `step` took `seconds`: "step 12/200  loss 2.3456  184.2 samples/s  ETA 0:01:03".
  std::string update(std::int64_t step, double loss, double samples_per_s, double seconds);
  // Seconds left after `step` at the current average; 0 with no step timed yet.
  double eta_seconds(std::int64_t step) const;

 private:
  std::int64_t total_;
  std::size_t window_;
  std::deque<double> recent_;  // the last `window_` step times
};

// How often rank 0 prints a progress line to a log (not a terminal): a round number of steps
// (1, 2 or 5 x 10^k) that gives at most 20 lines for the run, e.g. 200 for 2500 steps (125 rounded up).
std::int64_t default_progress_interval(std::int64_t total_steps);
// Whether `step` of `total` gets a progress line with one every `every` steps (0: none):
// every multiple of `every`, and always the first step this process runs and the last.
bool progress_due(std::int64_t step, std::int64_t first_step, std::int64_t total, std::int64_t every);

struct RunSummary {
  std::int64_t first_step = 1;   // the first step this process ran (resumed: checkpoint step + 1)
  std::int64_t last_step = 0;    // the last step it ran
  std::int64_t total_steps = 0;  // the run's length
  double seconds = 0;            // wall time of those steps
  double samples = 0;            // samples they processed
  double final_loss = 0;
  std::optional<EvalMetrics> last_eval;
  std::string checkpoint;  // the last checkpoint written, "" when none
};

// Lines printed when the run ends:
//   trained steps 101-200 of 200 in 0:01:40 (12800 samples, 128.0 samples/s)
//   final loss 0.1234
//   eval at step 200: retrieval_top1_i2t 0.8125, retrieval_top1_t2i 0.7969
//   checkpoint runs/clip/step-000200.braidckpt
std::string format_summary(const RunSummary& s);

}  // namespace braid::train
