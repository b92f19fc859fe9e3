"""Live: NVML on this machine (``nvml``), the fake NVML double (``fake_nvml``, and the C
library ``fakenvml/`` the real binding loads), the sampler in a thread or its own process
(``sampler``, ``sampler_process``, ``sampler_child``) and the crash-safe recorder."""
