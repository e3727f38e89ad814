// The hot set: export/tables/hot_rows.py's HotSet.save writes it with numpy.savez, the entries
// `table_sizes` and `ids_C1`..`ids_C<num_tables>`, each a 1-D integer array (npz.h reads them).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "npz.h"
#include "store.h"

namespace stages::embedding {

HotSet ReadHotSet(const std::string& path, size_t num_tables) {
  struct stat status;
  if (stat(path.c_str(), &status) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw LoadError("no hot-set file: " + path);
    throw LoadError("cannot read the hot-set file " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(status.st_mode)) throw LoadError("no hot-set file: " + path + " is not a file");
  HotSet hot_set;
  try {
    const npz::Archive archive(path);
    hot_set.table_sizes = archive.Get("table_sizes").values;
    if (hot_set.table_sizes.size() != num_tables) {
      throw LoadError(path + ": a hot set of " + std::to_string(hot_set.table_sizes.size()) +
                      " tables, the stage has " + std::to_string(num_tables));
    }
    for (size_t table = 0; table < num_tables; ++table) {
      hot_set.ids.push_back(archive.Get("ids_C" + std::to_string(table + 1)).values);
    }
  } catch (const npz::Error& error) {
    throw LoadError(path + ": not a hot-set file (" + error.what() + ")");
  }
  return hot_set;
}

}  // namespace stages::embedding
