from fairseq_plugins.cli.nounk_bleu import main

if __name__ == "__main__":
    main()
