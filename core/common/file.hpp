// Writing a whole text file so that readers see the old file or the new one, never half.
#pragma once

#include <string>

namespace braid {

// Writes `text` to a temporary file next to `path`, then renames it into place. Status::io
// naming `what` and the path on failure; an existing file at `path` is left intact then.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace braid
