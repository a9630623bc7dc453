"""The performance model: workloads, exact work and byte counts, hardware profiles, the fitted
cost model, and the timings and records it is fitted to and checked against."""
