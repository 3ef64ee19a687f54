from fairseq_plugins.cli.average_checkpoints import main

if __name__ == "__main__":
    main()
