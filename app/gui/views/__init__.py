"""The window's panes: document (drop, zoom), transcript (bursts), telemetry (plots), controls."""
