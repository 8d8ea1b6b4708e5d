// Writing a whole text file so that readers see the old file or the new one, never half.
#pragma once

#include <string>

namespace braid {

// Writes `text` to a temporary file next to `path`, then renames it into place. Status::io
// naming `what` and the path on failure; an existing file at `path` is left intact then.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

// Why no file can be written at `path` ("it is a directory", "no directory 'out'", "directory
// 'out' is not writable"), or "" when one can: checked before long work whose result would
// otherwise be lost at the end.
std::string unwritable_reason(const std::string& path);

}  // namespace braid
