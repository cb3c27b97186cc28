"""The thresholds the console judges GPUs by, each once: the health rules, the alert rules and
the screens' colour bands all read them here.

They are the guide's (``shared/reference/gpu-server-guide.zh.txt`` §4.2): alarm at 85 °C, keep
20 % of GPU memory in reserve; above 95 % used a job's next allocation likely fails.
"""

from __future__ import annotations

TEMP_HIGH_C = 85.0
"""The alert temperature; slowdown itself starts at the GPU's own slowdown temperature."""
MEMORY_RESERVE_FRACTION = 0.80
"""The guide keeps 20 % of GPU memory free as a buffer: more used is memory pressure."""
MEMORY_FULL_FRACTION = 0.95
"""Above this a job's next allocation likely fails with out-of-memory."""
