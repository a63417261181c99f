"""Running a node: the supervisor and its workers, the lifecycle of one worker, systemd notification, listening sockets, privileges, the development set-up."""
