from fairseq_plugins.cli.benchmark import main

if __name__ == "__main__":
    main()
