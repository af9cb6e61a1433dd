"""Campaign submission: frozen inputs, the journal, the jobs of a stage and their
continuation (`haico submit`, `haico continue`)."""
