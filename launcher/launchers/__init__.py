"""How ranks start: the two launchers, mpirun and srun, one module each, holding everything
jaxlaunch knows of that launcher. A local run starts its ranks with mpirun; a Slurm job with either
(the spec's slurm.launch).

  mpirun.py          which mpirun (find_mpirun), its command lines here and in an allocation (and
                     pinned to an attempt's nodes: pin_hosts), what it prints when a rank fails (read
                     for the root cause), its banners (kept from the console), and doctor's rows about
                     it (which MPI it is: identify_mpi, compare_mpi)
  srun.py            srun's command line in a batch script (and pinned to an attempt's nodes:
                     pin_nodelist), the environment its ranks need, and its reports of the tasks that
                     ended badly
  rank_start.py      what both start in every rank: its command (in the spec's container image when it
                     has one) and the environment it starts with
  rank_variables.py  the variables each launcher sets to tell a rank who it is (read by the rank's
                     topology and the drill's fault injection); light, since every rank imports it
  signal_words.py    the words launchers and faulthandler use for the signal that ended a rank

Backends build their commands from these, the supervisor reads the launchers' messages through
them (supervisor/root_cause.py, supervisor/streams.py), and nothing here imports a backend, the
supervisor or the CLI.
"""
