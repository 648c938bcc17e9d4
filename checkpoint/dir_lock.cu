// checkpoint/dir_lock.cu - the checks of checkpoint/dir_lock.h.
#include "checkpoint/dir_lock.h"

#include <climits>
#include <cstdio>

#include "checkpoint/hdf5_format.h"

std::string checkpoint_dir_path_problem(const std::string& dir, int max_step, int world_size) {
  char step[40];
  std::snprintf(step, sizeof(step), "/step_%06d.tmp/", max_step);
  const std::string longest = step + rank_file_name(world_size - 1);
  if (dir.size() + longest.size() < PATH_MAX) return "";
  return "the path is " + std::to_string(dir.size()) + " bytes long, and the trainer appends "
         "names of up to " + std::to_string(longest.size()) + " bytes under it (" +
         longest.substr(1) + "): together they reach the system's limit on a path, PATH_MAX = " +
         std::to_string(PATH_MAX) + " bytes including the terminating zero; choose a dir of at "
         "most " + std::to_string(PATH_MAX - 1 - longest.size()) + " bytes";
}
