"""``python -m hetsched`` is the ``hetsched`` command."""

from hetsched.cli import main

if __name__ == "__main__":
    main(prog_name="hetsched")
