"""test/checks.py - the pass/fail bookkeeping of the Python test drivers (Checks, for the
trainer-level tests; test/trainer.py re-exports it) and the TEST_ONLY filter that every driver's
check helper shares (Filter): run one check, or one test, alone (test/README.md, "Running one
check"), and the TEST_FULL switch of the long matrices (FULL). The same rule as the C++
programs' test/check_results.h.

TEST_ONLY=PATTERN (test/run_all.sh GROUP --only PATTERN sets it): a check counts only when
PATTERN occurs in its name (plain substring, case-sensitive); the others are counted as filtered
out, never as passed. Work is skipped only where a driver asks wanted(name) before doing it:
true when there is no filter, or the name and the pattern are one inside the other. A unit of
work picked by its name (Checks.run_each below) counts every check it makes. finish()
prints what the filter left out and fails a filtered run in which no check matched.

The variable is taken out of the environment when this module is imported, so the programs a
driver starts (a C++ test program it runs and parses, say) run whole."""
import contextlib
import os
import sys

PATTERN = os.environ.pop("TEST_ONLY", "")

# TEST_FULL=1 (make test-full): the long matrices too. Without it a driver runs a subset that
# still checks every feature it covers once (test/README.md, "make test and the full targets");
# what it leaves out it names on a line of its output (full_only below).
FULL = os.environ.get("TEST_FULL", "0") == "1"


def full_only(driver, left_out):
    """Prints what a run without TEST_FULL leaves out (a list of names); nothing under it."""
    if left_out and not FULL:
        print(f"{driver}: {len(left_out)} more only with TEST_FULL=1 (make test-full): "
              + "; ".join(left_out))


class Filter:
    def __init__(self):
        self.filtered = 0  # checks made but left out
        self.skipped = 0   # units of work not run
        self.whole = 0     # > 0 inside a unit picked by name: every check counts

    def counts(self, name):
        """Whether the check `name` counts (call it after the check's work)."""
        if not PATTERN or self.whole or PATTERN in name:
            return True
        self.filtered += 1
        return False

    def wanted(self, name):
        """Whether the unit of work `name` runs (call it before the work)."""
        if not PATTERN or self.whole or PATTERN in name or name in PATTERN:
            return True
        self.skipped += 1
        return False

    def picks(self, names):
        """Of the units `names`, those the pattern names; None when it names none (then all run
        and their checks are filtered one by one)."""
        picked = {n for n in names if PATTERN and PATTERN in n}
        return picked or None

    @contextlib.contextmanager
    def picked_unit(self):
        self.whole += 1
        try:
            yield
        finally:
            self.whole -= 1

    def finish(self, checks_run):
        """Prints what was left out; True when the run must fail because nothing matched."""
        if not PATTERN:
            return False
        print(f"TEST_ONLY={PATTERN!r}: {checks_run} checks run, {self.filtered} filtered out, "
              f"{self.skipped} units of work not run")
        if checks_run == 0:
            print(f"FAIL no check matched TEST_ONLY={PATTERN!r}")
        return checks_run == 0


class Checks:
    """Collects named pass/fail checks; report() exits non-zero if any failed. Honours TEST_ONLY
    (Filter above): check() counts only the checks it names, run_each() runs only the
    tests it names (all of them when it names none)."""

    def __init__(self, name):
        self.name, self.failed, self.passed = name, [], 0
        self.only = Filter()

    def check(self, what, ok, detail=""):
        if not self.only.counts(what):
            return
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)

    def wanted(self, name):
        """Whether the work named `name` is to run under TEST_ONLY: ask before running it."""
        return self.only.wanted(name)

    def run_each(self, *tests):
        """Runs each test (a callable); one that raises a usual error of a broken run (a missing
        file or record, a bad value, an unfinished job) is a failed check, and the next runs.
        A test's name is its function's, or for `lambda: test_x(...)` the test_x it calls."""
        names = [test_name(t) for t in tests]
        picked = self.only.picks(names)
        for test, name in zip(tests, names):
            if picked is not None and name not in picked:
                self.only.skipped += 1
                continue
            with self.only.picked_unit() if picked else contextlib.nullcontext():
                try:
                    test()
                except (RuntimeError, OSError, KeyError, ValueError, TypeError,
                        StopIteration) as e:
                    print(f"  FAIL test ran: {name}: {type(e).__name__}: {e}", flush=True)
                    self.failed.append(f"{name} ran")  # counted whatever the filter

    def report(self):
        nothing_matched = self.only.finish(self.passed + len(self.failed))
        if self.failed:
            print(f"{self.name}: {len(self.failed)} FAILED: {', '.join(self.failed)}")
            sys.exit(1)
        if nothing_matched:
            sys.exit(1)
        print(f"{self.name}: all {self.passed} checks passed")


def test_name(test):
    """`test_x` for the function test_x and for `lambda: test_x(args)`."""
    if test.__name__ != "<lambda>":
        return test.__name__
    return next((n for n in test.__code__.co_names if n.startswith("test")), test.__name__)
