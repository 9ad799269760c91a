"""The reliability report: each test records the faults it injected and what came through them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FaultOutcome:
    """One kind of fault: how often it was injected, how often the system came through it."""

    suite: str
    kind: str
    injected: int
    survived: int
    rows_lost: int = 0
    secrets_found: int = 0


@dataclass
class ReliabilityReport:
    """Every outcome recorded in this test session, printed as one table at the end."""

    outcomes: list[FaultOutcome] = field(default_factory=list)

    def record(self, suite: str, kind: str, injected: int, survived: int, rows_lost: int = 0, secrets_found: int = 0):
        self.outcomes.append(FaultOutcome(suite, kind, injected, survived, rows_lost, secrets_found))

    def lines(self) -> list[str]:
        """A markdown table, one row per fault kind plus the totals."""
        out = [
            "| suite | fault | faults injected | survived | rows lost | secrets found |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for o in sorted(self.outcomes, key=lambda o: o.suite):  # workers report in any order; a suite's rows stay in order
            out.append(f"| {o.suite} | {o.kind} | {o.injected} | {o.survived} | {o.rows_lost} | {o.secrets_found} |")
        total = [sum(getattr(o, k) for o in self.outcomes) for k in ("injected", "survived", "rows_lost", "secrets_found")]
        out.append(f"| **total** | {len(self.outcomes)} kinds | {total[0]} | {total[1]} | {total[2]} | {total[3]} |")
        return out


REPORT = ReliabilityReport()
