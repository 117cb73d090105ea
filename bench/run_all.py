"""`make bench`: every benchmark in one run, then bench/results/README.md with the table."""

import subprocess
import sys
from pathlib import Path

from common import RESULTS, markdown_table

HERE = Path(__file__).parent
for script in ("basic.py", "basic_alone.py", "decon.py", "edf.py", "decon_edf.py", "stitch_pairs.py", "stitch_sweep.py",
               "registration.py", "validate.py", "cycle_cpu.py", "gpu_budget.py", "plex_bias.py"):
    print(f"== {script}", flush=True)
    subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]] if script == "basic.py" else
                   [sys.executable, str(HERE / script)], check=True)
subprocess.run([sys.executable, str(HERE / "gpu_cycle.py"), "--tiny", "--backend", "numpy"], check=True)
RESULTS.mkdir(exist_ok=True)
(RESULTS / "README.md").write_text("# plexgpu benchmarks (one run, same machine)\n\n" + markdown_table())
print(markdown_table())
