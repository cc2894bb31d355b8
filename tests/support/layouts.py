"""Two H200 layouts of the same instances, and the fragmentation settings the detection tests judge them by (not a
test module): one fragmented, one packed."""

from __future__ import annotations

from flexmig.detect import FragmentationSettings
from flexmig.mig import H200, Layout

__all__ = ["FRAGMENTATION", "FRAGMENTED", "PACKED"]

#: A repack makes room for a 4g (4 of 7 compute slices): recoverable score 0.57 with the default mix.
FRAGMENTED = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
#: The same instances packed at the top: a 3g and a 4g fit, no repack gains anything: recoverable 0.
PACKED = Layout.of(H200, [("2g.35gb", 4), ("1g.18gb", 6)])
#: A finding after 20 s above 0.35, ended after 20 s below 0.25.
FRAGMENTATION = FragmentationSettings(enter=0.35, exit=0.25, enter_after_s=20, exit_after_s=20)
