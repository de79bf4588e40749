"""The Zero-Mem query service: profile, routing, graph and hierarchy views, fusion, closure,
calibration (paper eq. 6-15), the baselines it is compared with, and the optional reader."""
