"""The portal's side of remote GPU (docs/remote-gpu.md): the per-project key every task of a project gets, with
which the project's CPU tasks and its GPU worker tasks (``hcs_remote``) authenticate each other."""
