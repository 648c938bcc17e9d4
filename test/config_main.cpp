// test/config_main.cpp - a stand-in for `./train_cpu config.toml --check-config` while the trainer
// is being written: loads the config (file, then `--section.key=value` overrides), prints the
// resolved TOML to stdout and exits 0; on any config error load_config exits non-zero itself.
//
// World size: env WORLD_SIZE (default 1); default backend "mpi", as in ./train_cpu. As a
// self-check it also re-parses the printed text and exits 3 if that does not give the same text
// back (the resolved text holds every key, so equal text means an identical Config).
#include <cstdio>
#include <cstdlib>

#include "config/config.h"

int main(int argc, char** argv) {
  const char* env = std::getenv("WORLD_SIZE");
  int world_size = env ? std::atoi(env) : 1;
  Config cfg = load_config(argc - 1, argv + 1, world_size, "mpi");
  Config again = parse_config_text(cfg.toml_text, cfg.path + " (resolved)", world_size, "mpi");
  if (again.toml_text != cfg.toml_text) {
    std::fprintf(stderr, "error: the resolved config does not round-trip:\n%s\n---\n%s",
                 cfg.toml_text.c_str(), again.toml_text.c_str());
    return 3;
  }
  std::fputs(cfg.toml_text.c_str(), stdout);
  return 0;
}
