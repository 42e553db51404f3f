// The names of writers' temporaries, and the sweep that removes those of dead writers.
//
// A writer's data has a name before it is complete only when the filesystem lacks O_TMPFILE, or
// for the instant between linking a finished O_TMPFILE to a temporary name and renaming that over
// the destination (common/atomic_file.h). Such a name is `.DEST.zckpt-tmp-PID-RANDOM` in the
// destination's folder: the writer's pid, so a sweep can tell a dead writer's at once, and
// sixteen random hex digits. Names of zckpt before these pids (`.DEST.zckpt-tmp-RANDOM`) are
// still recognised (no pid: removed on age alone).
//
// The sweep (RemoveStaleTemps, run by every new AtomicFile over its destination's folder, so a
// writer's start-up cleans what an earlier killed one left there, whatever its destination)
// removes a temporary only when nobody holds its flock(2) -- every writer keeps an exclusive lock
// on its temporary from before the name exists (O_TMPFILE) or right after creating it (the named
// fallback) until after its rename or unlink, and the kernel drops the lock when the writer dies,
// SIGKILL included -- and, in addition, its writer's pid is not alive on this machine or its mtime
// is at least kStaleTempSeconds old. The extra test covers the named fallback's instant between
// create and flock (the writer is alive then), and pids of other machines or pid namespaces (a
// shared filesystem: they must also have aged). Best effort: a temporary it cannot open, lock or
// remove (other owner, a filesystem without flock) is left alone.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace zckpt {

// How old (mtime, seconds) an unlocked temporary of a live or unknown pid must be before a sweep
// removes it.
inline constexpr int kStaleTempSeconds = 5;

// The marker every temporary's name carries (folder walkers skip such entries).
inline constexpr std::string_view kTempMarker = ".zckpt-tmp-";

// `.BASE.zckpt-tmp-PID-RANDOM` for a destination whose file name is `base`.
std::string TempName(const std::string& base, pid_t pid, unsigned long long random);

// True for a name a writer's temporary may have (either form above); sets *pid when the name has
// one.
bool IsTempName(std::string_view name, std::optional<pid_t>* pid = nullptr);

// Removes the dead writers' temporaries in `dir` (see above), skipping the entry named `own`.
// Never throws.
void RemoveStaleTemps(const std::string& dir, const std::string& own);

}  // namespace zckpt
