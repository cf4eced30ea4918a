"""The fuzzer's long profile: random programs under drawn groupings and targets, checked
against TVM's unfused build, until a time budget or a program count runs out.

    python scripts/fuzz.py --minutes 60            # seeds from 0, one line per failure
    python scripts/fuzz.py --seed 1006 --count 1   # replay one program

Each program is drawn from its seed alone, so a failing seed replays exactly. The tests run a
fixed slice of the same generator (``tests/test_fuzz.py``).
"""

from __future__ import annotations

import argparse
import collections
import time

from tvm_costfuse.fuzzing import Draws, check, draw_case, draw_program


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--count", type=int, default=10**9, help="programs at most")
    parser.add_argument("--minutes", type=float, default=60.0, help="time budget")
    parser.add_argument("--max-ops", type=int, default=10, help="ops per program at most")
    args = parser.parse_args()

    stop = time.monotonic() + 60 * args.minutes
    ran, failures, cases = 0, [], collections.Counter()
    seed = args.seed
    try:
        while ran < args.count and time.monotonic() < stop:
            draws = Draws.seeded(seed)
            program = draw_program(draws, args.max_ops)
            case = draw_case(draws)
            try:
                check(program, case, draws)
            except Exception as err:  # noqa: BLE001 -- every failure is a finding: go on
                failures.append(seed)
                print(f"seed {seed}: FAIL {type(err).__name__}: {str(err).strip()[:400]}",
                      flush=True)
            cases[(case.grouping, case.target)] += 1
            ran += 1
            seed += 1
    except KeyboardInterrupt:  # stopped early: the summary of what ran still counts
        print(f"interrupted at seed {seed}")
    print(f"{ran} programs (seeds {args.seed}..{seed - 1}), {len(failures)} failed"
          + (f": seeds {failures}" if failures else ""))
    for (grouping, target), n in sorted(cases.items()):
        print(f"  {grouping:10s} {target:8s} {n}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
