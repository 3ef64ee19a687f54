from fairseq_plugins.cli.tokenize import main

if __name__ == "__main__":
    main()
