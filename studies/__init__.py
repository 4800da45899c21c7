"""Studies played with dppo_oat, each in a folder of its own: its pre-registered claims, the scripts that play and
pack it, its packed runs and its report notebook. Beside the package, not in it: the ``dppo_oat`` wheel does not
install them; run them from a checkout (``python -m studies.cpu.run``)."""
