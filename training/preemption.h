// training/preemption.h - stopping on SIGTERM, SIGINT or SIGUSR1 without losing the run.
//
// Slurm sends SIGTERM before a preemption or the time limit (then SIGKILL after KillWait, 30 s
// by default); Ctrl-C sends SIGINT. Either used to kill the run where it stood, losing every step
// since the last checkpoint. Now:
//   1. the signal handler only records the signal (preemption_install);
//   2. the step in flight finishes; after it every rank asks the others whether any was
//      signalled (preemption_agreed: one host all-reduce of an int per step, uncounted - it is
//      control, not the model's data - so the planner's count and the metrics' comm are
//      unchanged), so all ranks stop after the same step even if only one got the signal;
//   3. the trainer saves a checkpoint of that step (due or not), prints
//      "preempted: SIGTERM received: stopped after step k of n; checkpoint ... saved", and exits
//      with status kExitPreempted (75, EX_TEMPFAIL: "try again later"), so that a job script
//      can tell a preempted run (requeue it) from a finished one (0) and a failed one (1).
//   4. a second signal exits at once (status 128 + the signal): the way out of a save that
//      hangs, or of a user who means it.
// Resuming ([checkpoint] resume = "latest") continues bit for bit (checkpoint/checkpoint.h).
//
// Who gets the signal. Under srun (and Slurm's time limit), every rank receives SIGTERM itself.
// Under mpirun, send SIGUSR1 to mpirun: Open MPI forwards it to every rank and passes status 75
// back. SIGTERM or SIGINT to mpirun does not work: Open MPI forwards SIGTERM but kills the ranks
// a second later (odls_base_sigkill_timeout), too soon to save. With Slurm and mpirun, have the
// batch shell catch the warning signal and pass it on (`#SBATCH --signal=B:USR1@120`,
// `trap 'kill -USR1 $pid' USR1`, `mpirun ... & pid=$!; wait $pid`).
#pragma once
#include "parallel/comm.h"

constexpr int kExitPreempted = 75;

// Installs the handlers of SIGTERM, SIGINT and SIGUSR1. Call once, after MPI is up.
void preemption_install();
// The first signal this rank received (SIGTERM, SIGINT or SIGUSR1), 0 if none.
int preemption_signal();
// The signal any rank of `world` received (the largest number, if several), 0 if none. All ranks
// call it after every step.
int preemption_agreed(Comm& world);
// "SIGTERM", "SIGINT", "SIGUSR1"
const char* signal_name(int sig);
