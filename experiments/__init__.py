"""Scripts that reproduce the papers' tables and figures from `configs/*.py` with the public lbjax API.

* `sweep`: a baseline config x scaling rules x batch sizes -> CSV, markdown table and plot
  (final test metric vs batch size, like Figure 1 of papers/001).
* `batch_schedule`: decaying LR vs increasing batch vs hybrid (papers/002) -> table and plots of
  test accuracy vs epochs and vs parameter updates.
"""
