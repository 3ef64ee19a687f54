"""The differences between two probe.py outputs and the pytest summary (scripts/test_compat.sh).

    python compare.py COMPAT.json MAIN.json PYTEST_LOG
"""
import json
import re
import sys

compat, main = (json.load(open(p)) for p in sys.argv[1:3])
rows = [(k, str(v), str(main["facts"].get(k, "-"))) for k, v in compat["facts"].items()]
w = [max(len(r[i]) for r in rows + [("", "compat env", "usual env")]) for i in range(3)]
print(f"{'':{w[0]}}  {'compat env':{w[1]}}  usual env")
for k, a, b in rows:
    print(f"{k:{w[0]}}  {a:{w[1]}}  {b}{'' if a == b else '   <- differs'}")
for kind in compat["builtin"]:
    a, b = set(compat["builtin"][kind]), set(main["builtin"].get(kind, []))
    if b and a != b:
        print(f"fairseq built-in {kind}s only in the usual env ({len(b - a)}): {', '.join(sorted(b - a)) or '-'}")
        print(f"fairseq built-in {kind}s only in the compat env ({len(a - b)}): {', '.join(sorted(a - b)) or '-'}")
summary = [ln for ln in open(sys.argv[3]).read().splitlines() if re.match(r"=*\s*\d+ (passed|failed|error).* in [\d.]+s", ln)]
print(f"pytest on {compat['facts']['fairseq']}, Python {compat['facts']['python']}, "
      f"torch {compat['facts']['torch']}: {summary[-1].strip('= ') if summary else 'no summary line'}")
