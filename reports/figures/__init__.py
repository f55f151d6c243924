"""One module per figure of a comparison report; each has ``draw(frame, ...) -> Figure``.

1 ``comparison``: throughput and peak bytes per policy; 2 ``memory``: bytes per pool over one step;
3 ``timeline``: the streams of one GPU, the CPU and NVMe over one step; 4 ``links``: link rates over the
step; 5 ``coverage``: policy x model heatmap; 6 ``whatif``: sensitivity tornado; 7 ``replay``: simulated
versus measured. The data comes from ``reports.frames``; ``reports.build`` saves figures, CSVs and pages.
"""
