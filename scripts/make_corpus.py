from fairseq_plugins.cli.make_corpus import main

if __name__ == "__main__":
    main()
