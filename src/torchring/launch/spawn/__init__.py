"""Starting a job's processes and relaying their output: the spawner (local, over SSH under the
``remote_rank`` supervisor, in containers), the rank environment, the SSH preflight, the remote link
(heartbeat, remote stack samples) and the one record of a started process (``worker``). May import
``launch.sampling``, ``launch.hosts`` and the leaf modules."""
