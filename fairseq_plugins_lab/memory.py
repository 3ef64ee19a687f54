"""Memory over a long training run: RSS samples of a process, and the verdict on their growth.

Used by the memory soak (``scripts/soak.sh``).
"""
import re
import statistics

def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (VmRSS of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:") and int(line.split()[1]) > 0:  # 0 kB while the process exits
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def verdict(samples, warmup_minutes: float, tolerance: float) -> dict:
    """Growth of RSS after the warm-up: median of the last 3 samples against the first 3.

    ``samples`` are (minute, rss_mib) pairs. Medians of 3 keep one allocator spike from
    deciding; the least-squares slope is reported beside it.
    """
    steady = [(t, m) for t, m in samples if t >= warmup_minutes]
    if len(steady) < 6:
        raise ValueError(f"need at least 6 samples after the {warmup_minutes:g}-minute warm-up, got {len(steady)}")
    start = statistics.median(m for _, m in steady[:3])
    end = statistics.median(m for _, m in steady[-3:])
    times, mems = [t for t, _ in steady], [m for _, m in steady]
    mean_t, mean_m = statistics.fmean(times), statistics.fmean(mems)
    slope = sum((t - mean_t) * (m - mean_m) for t, m in steady) / sum((t - mean_t) ** 2 for t in times)
    growth = (end - start) / start
    return {"start_mib": start, "end_mib": end, "growth": growth, "slope_mib_per_hour": slope * 60,
            "peak_mib": max(mems), "grew": growth > tolerance}


def count(log_path: str, pattern: str) -> int:
    with open(log_path) as f:
        return sum(1 for line in f if re.search(pattern, line))


def last_update(log_path: str) -> int:
    """The last ``num_updates`` fairseq logged."""
    with open(log_path) as f:
        found = re.findall(r"num_updates (\d+)", f.read())
    return int(found[-1]) if found else 0
