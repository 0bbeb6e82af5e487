"""``python -m procledger`` runs the CLI."""

from procledger.cli import main

if __name__ == "__main__":
    main()
