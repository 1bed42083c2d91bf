#include "storage/remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "storage/file_system.h"

namespace dcp::storage {
namespace {

// Removes `name` of the directory open as `dir_fd`: a file or link by unlinkat, a directory
// after its entries. `shown` names it in errors.
Status RemoveAt(int dir_fd, const std::string& name, const std::string& shown) {
  if (::unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT) return OkStatus();
  const int unlink_err = errno;
  if (unlink_err != EISDIR && unlink_err != EPERM) return ErrnoStatus("remove", shown, unlink_err);
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return OkStatus();
    // Not a directory (a link, or a file unlink may not remove): unlink's error says why.
    if (err == ENOTDIR || err == ELOOP) return ErrnoStatus("remove", shown, unlink_err);
    // An empty directory this process may not read still goes.
    if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return OkStatus();
    return ErrnoStatus("remove", shown, err);
  }
  DIR* d = ::fdopendir(fd);
  if (!d) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("list", shown, err);
  }
  // Read whole before removing: entries removed during a listing may make it skip others.
  auto names = ReadDirectoryNames(d, shown);
  Status st = names.status();
  for (size_t i = 0; st.ok() && i < names->size(); ++i) {
    st = RemoveAt(::dirfd(d), (*names)[i], JoinPath(shown, (*names)[i]));
  }
  ::closedir(d);
  if (!st.ok()) return st;
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return OkStatus();
  return ErrnoStatus("remove", shown, errno);
}

// FileSystem::RemoveTree's default, through the file system's own List and Remove.
Status RemoveBelow(FileSystem& fs, const std::string& path, bool top) {
  // Where there are links, a path is first removed as a file or an empty directory: a link
  // goes, and listing it would follow it. An object store's directory is a key prefix.
  Status removed = OkStatus();
  if (!fs.IsObjectStore()) {
    removed = fs.Remove(path);
    if (removed.ok()) return removed;
  }
  auto entries = fs.List(path);
  if (!entries.ok()) return fs.IsObjectStore() ? entries.status() : removed;
  for (const std::string& e : *entries) {
    DCP_RETURN_IF_ERROR(RemoveBelow(fs, JoinPath(path, e), /*top=*/false));
  }
  // An object store's unfinished uploads under the tree and under each directory it lists
  // (best effort: a save there drops them too, holding its lock); an object lists nothing.
  if (top || !entries->empty()) (void)fs.DropUnfinishedWrites(path);
  return fs.Remove(path);
}

}  // namespace

Result<std::vector<std::string>> ReadDirectoryNames(DIR* d, const std::string& shown) {
  std::vector<std::string> names;
  while (true) {
    errno = 0;  // readdir returns null at the end and on an error: only errno tells them apart
    const dirent* e = ::readdir(d);
    if (!e) break;
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  if (errno != 0) return ErrnoStatus("list", shown, errno);
  return names;
}

Status CheckRemovableTree(const std::string& path, const std::string& name) {
  if (name.empty() || name == "." || name == "..") {
    return InvalidArgument("refusing to remove the tree '" + path + "'");
  }
  return OkStatus();
}

Status RemoveTreeNoFollow(const std::string& path) {
  const std::string name = LastComponent(path);
  DCP_RETURN_IF_ERROR(CheckRemovableTree(path, name));
  const std::string parent = ParentPath(path);
  // O_PATH: removing an entry needs write and search permission on its directory, not read.
  const int dir_fd =
      ::open(parent.empty() ? "." : parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return errno == ENOENT ? OkStatus() : ErrnoStatus("remove", path, errno);
  Status st = RemoveAt(dir_fd, name, path);
  ::close(dir_fd);
  return st;
}

Status FileSystem::RemoveTree(const std::string& path) {
  std::string p = path;  // "dir/link/" would name what the link points to
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  DCP_RETURN_IF_ERROR(CheckRemovableTree(path, LastComponent(p)));
  return RemoveBelow(*this, p, /*top=*/true);
}

}  // namespace dcp::storage
