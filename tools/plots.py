"""PNG charts through matplotlib, an optional extra (`pip install '.[plots]'`); each function says
what it did, or that it skipped for want of matplotlib."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np

from .scoring import Decision

MISSING = "matplotlib is not installed (pip install '.[plots]'): skipped {name}"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def available() -> bool:
    """Whether matplotlib imports (one note then stands for every chart a command would have written)."""
    return _pyplot() is not None


def reliability_diagrams(bins: dict[str, list[tuple[float, float, int]]], path: Path) -> str:
    plt = _pyplot()
    if plt is None:
        return MISSING.format(name=path.name)
    fig, axes = plt.subplots(1, max(len(bins), 1), figsize=(4 * max(len(bins), 1), 4), squeeze=False)
    for ax, (kind, rows) in zip(axes[0], sorted(bins.items())):
        ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
        if rows:
            conf, acc, n = zip(*rows)
            ax.bar(conf, acc, width=1 / 15, alpha=0.6, edgecolor="black", label="accuracy per bin")
            ax.scatter(conf, acc, s=np.array(n) * 4, color="black", zorder=3)
        ax.set(title=f"{kind}: reliability", xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
        ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


def coverage_curves(decisions: dict[str, list[Decision]], path: Path) -> str:
    plt = _pyplot()
    if plt is None:
        return MISSING.format(name=path.name)
    fig, ax = plt.subplots(figsize=(5, 4))
    for kind, ds in sorted(decisions.items()):
        order = np.argsort([-d.confidence for d in ds])
        hits = np.cumsum([ds[i].correct for i in order])
        n = np.arange(1, len(ds) + 1)
        ax.plot(n / len(ds), hits / n, label=kind)
    ax.set(title="precision of the decisions taken alone", xlabel="coverage (share taken, most confident first)",
           ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    ax.axhline(0.95, color="grey", ls=":")
    ax.axhline(0.99, color="grey", ls="--")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


def latency_charts(latencies_ms: dict[int, list[float]], throughput: dict[int, float], path: Path) -> str:
    plt = _pyplot()
    if plt is None:
        return MISSING.format(name=path.name)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for c, values in sorted(latencies_ms.items()):
        a.hist(values, bins=30, alpha=0.5, label=f"concurrency {c}")
    a.set(title="latency distribution", xlabel="ms", ylabel="requests")
    a.legend()
    levels = sorted(throughput)
    b.plot(levels, [throughput[c] for c in levels], marker="o")
    b.set(title="throughput vs concurrency", xlabel="concurrent clients", ylabel="requests per second")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


def drift_chart(title: str, starts: list[datetime], shares: dict[str, list[float]], means: dict[str, list[float]],
                path: Path) -> str:
    """One question's answers over time: the share of each top answer and the mean probability of each option, per
    time bucket (`clef-bridge report`)."""
    plt = _pyplot()
    if plt is None:
        return MISSING.format(name=path.name)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, series, what in ((a, shares, "share of each top answer"), (b, means, "mean probability per option")):
        for option, values in series.items():
            ax.plot(starts, values, marker="o", label=option)
        ax.set(title=f"{title}: {what}", xlabel="bucket start (UTC)", ylim=(0, 1.02))
    a.legend(loc="best", fontsize=7)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"
