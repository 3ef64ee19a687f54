"""The counts of one module's mutation run, and each survivor's diff: reads `cosmic-ray dump` on stdin.

Usage: cosmic-ray dump SESSION | python scripts/mutation_summary.py MODULE
       cosmic-ray dump SESSION | python scripts/mutation_summary.py --unkilled
         (one line per survivor or timeout: module path, operator, occurrence, line; for a recheck)
"""
import collections
import json
import sys


def unkilled():
    for line in sys.stdin:
        item, result = json.loads(line)
        if result and (result["test_outcome"] == "survived" or result.get("output") == "timeout"):
            mutation = item["mutations"][0]
            print(mutation["module_path"], mutation["operator_name"], mutation["occurrence"], mutation["start_pos"][0])


def main():
    if sys.argv[1] == "--unkilled":
        return unkilled()
    module = sys.argv[1]
    counts, survivors = collections.Counter(), []
    for line in sys.stdin:
        item, result = json.loads(line)
        if result is None:
            counts["not run"] += 1
        elif result["worker_outcome"] == "skipped":
            counts["left out (operator)"] += 1
        elif result["worker_outcome"] == "timeout" or result.get("output") == "timeout":
            counts["timeout"] += 1
        elif result["test_outcome"] == "survived":
            counts["survived"] += 1
            mutation = item["mutations"][0]
            survivors.append(f"{mutation['operator_name']} at line {mutation['start_pos'][0]}:\n{result['diff']}")
        elif result["test_outcome"] == "incompetent":
            counts["incompetent"] += 1
        else:
            counts["killed"] += 1
    run = sum(counts[k] for k in ("killed", "survived", "timeout", "incompetent"))
    print(f"{module}: {run} mutants run: {counts['killed']} killed, {counts['survived']} survived, "
          f"{counts['timeout']} timeouts, {counts['incompetent']} incompetent; "
          f"{counts['left out (operator)']} left out, {counts['not run']} not run")
    for survivor in survivors:
        print("survived:", survivor)


if __name__ == "__main__":
    main()
