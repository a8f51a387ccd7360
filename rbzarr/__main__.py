"""``python -m rbzarr``: the same command line as the ``rbzarr`` script."""

from rbzarr.cli.main import main

if __name__ == "__main__":
    main(prog_name="rbzarr")
