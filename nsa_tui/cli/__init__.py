"""The ``nsa-tui`` command line: parsing, the commands on one host or several, their output.

``main`` (the ``nsa-tui`` entry point) parses with ``args``, connects, and hands a command
to ``one`` (one host) or ``multi`` (a run over several hosts); ``text`` formats what people
read, ``exitcodes`` is the one table of exit codes, ``runref`` resolves a typed run name,
``sample`` streams generated text, ``export`` writes metrics for other tools. Everything
that talks to a host goes through ``nsa_tui.hosts``.
"""
