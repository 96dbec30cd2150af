"""The paper's runs: presets, the launcher, the CPU time estimate, the GPU memory plan."""
