"""Read committed results (CPU): the knee experiment's DRAM reads per schedule and sequence
length, median and range over the repeats, as the paper's figure reads them.

    python examples/05_read_results.py

`Study(data)` is how every experiment reads data/: `load(name)` gives a data set's measured
rows (one per repeat; docs/data.md lists the columns), `records(kind, name)` its JSONL records.
"""
from pathlib import Path

from wavefront.report.analysis import Study

knee = Study(Path(__file__).resolve().parents[1] / "data").load("knee")
knee["schedule"] = knee.cta_schedule + "+" + knee.kv_schedule
dram_mb = knee.assign(dram_mb=knee.dram_read_bytes / 1e6)
table = dram_mb.groupby(["gpu", "schedule", "seqlen"]).dram_mb.agg(["median", "min", "max",
                                                                    "count"])
print(table.round(1).to_string())
