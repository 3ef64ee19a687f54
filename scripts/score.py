from fairseq_plugins.cli.score import main

if __name__ == "__main__":
    main()
