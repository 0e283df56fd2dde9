// Compiled once to produce the precompiled header that every tessera target reuses.
