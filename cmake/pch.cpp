// Compiled once per precompiled header (src/CMakeLists.txt: tessera_pch, tessera_full_pch) to produce it.
