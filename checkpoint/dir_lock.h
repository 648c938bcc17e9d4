// checkpoint/dir_lock.h - what a checkpoint directory must be before the first step: short
// enough for every name the trainer puts in it.
//
// Path length. The kernel refuses a path of PATH_MAX (4096) bytes or more, and the trainer
// appends names under [checkpoint] dir, the longest being a rank file inside the temporary
// directory of a save, "/step_000123.tmp/rank_00007.h5" (with the digits of [train] steps and of
// the world size). The start-up probe writes a shorter name, so a dir near the limit used to pass
// it and fail only at the first save; it is refused at start-up instead, naming its length, the
// longest name and the limit.
#pragma once
#include <string>

// "" or the problem, naming the dir's length, the longest name appended and PATH_MAX.
std::string checkpoint_dir_path_problem(const std::string& dir, int max_step, int world_size);
