// Writing a whole text file so that readers see the old file or the new one, never half.
#pragma once

#include <string>

namespace braid {

// Writes `text` to a temporary file next to `path`, then renames it into place. Status::io
// naming `what` and the path on failure; an existing file at `path` is left intact then.
// Through a symbolic link, the file it names is replaced (the link stays); a path that is no
// regular file (/dev/null, /dev/stdout, a FIFO) is written to directly, never replaced.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

// The file a write to `path` should replace: the one a symbolic link names, else `path`.
std::string file_behind(const std::string& path);
// True when `path` exists and is neither a regular file nor a directory (a device, a FIFO).
bool is_special_file(const std::string& path);
// Whether two paths name one place, a file or a directory, as spelled or through links
// ("ckpt", "./ckpt/", a link to it); either may not exist yet.
bool same_path(const std::string& a, const std::string& b);

// Why no file can be written at `path` ("it is a directory", "no directory 'out'", "directory
// 'out' is not writable", "cannot create a file in '/proc'"), or "" when one can: checked
// before long work whose result would otherwise be lost at the end.
std::string unwritable_reason(const std::string& path);

}  // namespace braid
