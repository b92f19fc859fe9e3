"""Fleet: the Prometheus HTTP client (Prometheus, Thanos, Mimir, VictoriaMetrics) and the
dcgm-exporter text format and label conventions (``dcgm``)."""
