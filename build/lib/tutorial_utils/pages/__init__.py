"""Page plumbing: what the chapters call to set up devices, print, tabulate and plot.

Nothing here is what a chapter teaches; the code a reader copies is at the top level of
``tutorial_utils`` and in ``tutorial_utils.te``.
"""
