-- wrk: print the latency percentiles and counts of the run as one JSON line (milliseconds).
done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status
    + summary.errors.timeout
  io.write(string.format(
    '{"requests": %d, "errors": %d, "seconds": %.3f, "p50_ms": %.1f, "p95_ms": %.1f, "p99_ms": %.1f, "max_ms": %.1f}\n',
    summary.requests, errors, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(95) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
