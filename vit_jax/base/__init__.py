"""The bottom layer: errors, paths, platforms, the console, devices and the mesh."""
