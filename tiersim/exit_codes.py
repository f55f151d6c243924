"""The process exit codes of every tiersim command, in one place.

    0    success (``simulate``: the job fits; ``plan``/``whatif``/``coverage``/``max-model``: something fits)
    1    a check failed: ``simulate --check`` found a violated simulator invariant, ``replay --verify`` a
         mismatch with plain training, ``validate`` a case outside its tolerance, ``sweep`` a failed point
         (each a finding about tiersim or the run, not about the input)
    2    bad input: exactly one line on stderr naming the field or file and the fix, nothing on stdout
    3    infeasible: printed on stdout as an answer (which pool overflows, by how much)
    4    not settled: a search command's ``--budget`` ran out before anything it evaluated fit and before it
         proved that nothing fits (what was cut is printed; a cut is not a verdict of infeasibility)
    130  interrupted by SIGINT (Ctrl-C): one line on stderr; no output file is left half-written (``sweep``:
         what finished is stored)
    141  standard output closed (``>&-``) or its reader gone (``| head -1``): one line on stderr
    143  terminated by SIGTERM: as 130
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INVARIANT = 1   # simulate --check: a violated simulator invariant
EXIT_MISMATCH = 1    # replay --verify: the replayed training differs from plain training
EXIT_FAILED = 1      # validate: a case outside its tolerance; sweep: a point failed or the executor broke down
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_CUT = 4  # plan/whatif/coverage/max-model/simulate: budget ran out, nothing feasible and nothing proven
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE: stdout closed, or its reader went away
EXIT_TERMINATED = 143  # 128 + SIGTERM

__all__ = ["EXIT_BAD_INPUT", "EXIT_CUT", "EXIT_FAILED", "EXIT_INFEASIBLE", "EXIT_INTERRUPTED", "EXIT_INVARIANT",
           "EXIT_MISMATCH", "EXIT_OK", "EXIT_STDOUT_CLOSED", "EXIT_TERMINATED"]
